"""Backends of torch.ops.flash_cann, one module per backend named in the op spec."""
