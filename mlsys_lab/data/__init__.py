"""mlsys_lab.data"""
