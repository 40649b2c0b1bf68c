"""mlsys_lab.viz"""
