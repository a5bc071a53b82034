//! CUDA path (owned by the CUDA helper; placeholder).
