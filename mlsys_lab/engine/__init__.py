"""mlsys_lab.engine"""
