"""The Transformer itself: layers, attention, positional encodings, size and FLOPs."""
