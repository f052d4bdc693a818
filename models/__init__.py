"""polydev's model layer: GGUF files, weight placement over devices, tokenizers.

It uses only what ``polydev`` exports and asks the registry for devices; it never names a
backend module (DESIGN.md).
"""
