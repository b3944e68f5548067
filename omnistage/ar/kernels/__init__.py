"""In-place paged attention kernels: paged_attention.cpp (CPU), paged_attention_triton.py (CUDA)."""
