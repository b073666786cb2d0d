// Anchor translation unit for the shared LibTorch precompiled header
// (target asympo_torch_pch); it defines nothing.
