"""Server side of each method: a Flower ``Strategy`` (legacy API) per module."""
