"""The driver: device actors' hosts, their gRPC service and the clients that reach them.

Importing it sets nothing: a process prepares Ray's environment before it imports Ray
(:func:`runtime.cluster.rayenv.prepare`); a device host runs in a Ray worker, which has it from its raylet.
"""
