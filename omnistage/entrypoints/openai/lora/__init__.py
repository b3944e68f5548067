"""GET/POST /v1/lora_adapters, DELETE /v1/lora_adapters/{name}: list, load and unload the LoRA
adapters a diffusion or native AR stage loads by path (deploy `max_loras`) while it serves."""
