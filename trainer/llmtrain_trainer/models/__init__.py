"""The model: the Llama decoder, its sharding-independent initialisation, and Hugging Face weights and config."""
