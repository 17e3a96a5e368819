"""The local serving stack (transformers with fixlab's batching engine, llama.cpp) behind agents.models' Model protocol."""

# The engine's arithmetic, versioned: bumped whenever a change to the kernels or the engine changes which bits a
# request's answer gets, so that cached trajectories from the older arithmetic are not replayed as this one's
# (flows/cache.py). 2: batch-invariant attention (prefill, decode and drafts in one kernel, the softmax sum in a fixed
# order) and float32 matmuls in fixlab's packed kernel.
NUMERICS = 2
