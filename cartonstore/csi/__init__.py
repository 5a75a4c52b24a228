"""The CSI node plugin (``cartonstore csi``): pods mount models as read-only
inline ephemeral volumes. A door of its own, beside the daemon's: it talks
to the node's daemon over its Unix socket (client/) and holds no store
access of its own.

- servicer.py: CSI v1's Identity and Node services on grpcio, ``serve``;
- volumes.py: publish (lease through the daemon, bind read-only), unpublish,
  volume stats; the checks of what the kubelet asks;
- mounts.py: mount(2) and umount2(2);
- mountinfo.py: the pure parser of /proc/self/mountinfo;
- proto/: the CSI spec's csi.proto and the modules protoc made of it.
"""
