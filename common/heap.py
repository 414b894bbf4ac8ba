"""The cyclic collector of a server process, set for serving once its long-lived objects exist."""

from __future__ import annotations

import gc

# a request allocates a few hundred container objects, most freed by reference counting; at Python's default of
# 700 a young collection runs every other request or so, each time also walking what survived the one before
YOUNG_THRESHOLD = 50_000


def settle_for_serving(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Exempt every object alive now (modules, the app, its settings, pools) from future collections, and let
    the young generation grow larger between collections: what a collection scans is then the few objects of the
    requests in flight, not the whole process."""
    gc.collect()  # what start-up left as garbage goes now, not into the frozen set for good
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
