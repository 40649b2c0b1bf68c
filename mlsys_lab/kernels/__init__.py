"""mlsys_lab.kernels"""
