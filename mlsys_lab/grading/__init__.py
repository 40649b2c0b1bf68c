"""mlsys_lab.grading"""
