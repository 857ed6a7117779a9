"""How ranks' frames travel: ``wire`` (frames, HMAC-SHA256), ``links`` (the
hub/member protocol: handshake, replay protection, failure detection),
``chan`` (what a transport provides), ``direct`` and ``direct_member`` (stream
sockets, the default) and ``zeromq`` (ROUTER/DEALER)."""
