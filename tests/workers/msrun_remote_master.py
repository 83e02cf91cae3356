"""`msrun` for a node whose master is on another host. Two nodes simulated on one machine both see the
master address as local, and msrun would start a second scheduler on the master port; on a real second
host msrun makes exactly this decision itself (the master address is not one of its own)."""
import sys

from mindspore.parallel.cluster.process_entity import _api

_api._is_local_ip = lambda ip: False

if __name__ == "__main__":
    from mindspore.parallel.cluster.run import main
    sys.exit(main())
