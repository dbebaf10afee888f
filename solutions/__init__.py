"""Transformer Deep Dive: the reference library, one module per concept in course order."""
