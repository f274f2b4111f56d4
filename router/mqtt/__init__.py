"""MQTT at the edges: the packet codec (codec.py, packets.py)."""
