def doctor():
    """Doctor."""
def check(model: str):
    """Check."""
