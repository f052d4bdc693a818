"""Backends: one subpackage per vendor, each registered through the ``polydev.backends``
entry-point group. ``array`` holds the array-API kernels the CPU and CUDA backends share."""
