"""Reference MLA+MoE DDTree engine and its OpenAI-compatible server (data plane)."""
