"""kilnd, as the client reaches and runs it: the API (api, from the shipped
kiln_v1.desc), where kilnd is and how to connect or start one (paths,
connection, fleet, autostart, early_start), the error a missing kilnd raises (errors), and kilnd
installed as the machine's service (machine_service and its Linux and Windows
halves, windows_acl). Depends on nothing else of Kiln's."""
