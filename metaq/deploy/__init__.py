"""Deploying a metaq cluster over SSH (``fabfile.py`` at the repository root drives it).

* ``layout``    where everything lives under a host's install dir (the only place that names files);
* ``inventory`` the cluster inventory (``conf/cluster.yaml``): validation and each broker's server.yaml;
* ``bundle``    the package to ship: the metaq wheel and its dependencies' wheels, built once per run;
* ``remote``    the small programs the control machine runs on a host before metaq is installed there;
* ``agent``     runs *on the host*, from the installed package: start, stop, status of the broker.

Nothing here imports Fabric: only ``fabfile.py`` does. ``agent`` and ``layout`` import the
standard library and ``metaq.protocol`` only, so they run in the host's virtualenv.
"""
