"""kilnd, as the client reaches and runs it: the API (api, from the shipped
kiln_v1.desc, encoded by wire), where kilnd is and how to connect or start one
(paths, connection, fleet, autostart, early_start), the transports that carry
its calls (local_grpc, http2 and hpack for this machine's kilnd, grpc_channel and
grpc_runtime for TLS and fleets), the errors a call or a missing kilnd raises
(errors), and kilnd installed as the machine's service (machine_service and its
Linux and Windows halves, windows_acl). Depends on nothing else of Kiln's."""
