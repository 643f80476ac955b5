"""Durable backends, one module (or package) per URL scheme, imported only when used."""
