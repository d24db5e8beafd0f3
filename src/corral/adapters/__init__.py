"""Adapters to the libraries and frameworks trainers and authors already use."""
