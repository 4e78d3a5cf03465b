"""A least-recently-used cache."""


class LRUCache:
    def __init__(self, capacity):
        raise NotImplementedError("implement LRUCache")
