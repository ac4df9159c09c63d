"""Extraction: choosing the cheapest program of the saturated e-graph.

    extract     the serialized e-graph (egraph-serialize JSON) and the greedy extractors
    ilp         the exact extractor (HiGHS), acyclic, with its LP bound and gap
    cost        an e-node's price: the cost model applied to the e-graph's types
    costmodel   the physical cost model: a roofline per kernel
    machine     the machine's numbers the cost model reads (DEFAULT or this host's)
    calibrate   measures those numbers on this host and caches them
"""
