"""mlsys_lab.deploy"""
