"""vnpu's runtime: the Pythonic API (:mod:`runtime.api`), pyACL (:mod:`runtime.acl`), HCCL, models, the
compiler, the cluster, serving and the command line.

Importing any of it sets no environment variable and starts nothing: what a process needs before Ray is
imported is :func:`runtime.cluster.rayenv.prepare`'s job, and a sanitizer asked for in the environment
(``VNPU_SANITIZE``) starts when the process makes a runtime or prepares for Ray.
"""
