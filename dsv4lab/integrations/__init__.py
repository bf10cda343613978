"""The lab's kernels inside serving frameworks: :mod:`dsv4lab.integrations.sglang`."""
