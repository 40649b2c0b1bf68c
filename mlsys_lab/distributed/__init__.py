"""mlsys_lab.distributed"""
