"""The local serving stack (transformers with fixlab's batching engine, llama.cpp) behind agents.models' Model protocol."""
