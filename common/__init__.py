"""What routers, the mesh and clients all use: the asyncio/Proton engine I/O layer, ids, wire vocabulary,
errors, the settlement-log writer. It imports nothing else of oncemesh."""
