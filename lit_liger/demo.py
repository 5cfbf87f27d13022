def demo(out_dir: str = "x"):
    """Demo."""
