#!/bin/sh
# Open MPI rsh agent for the emulated cluster: "rsh_agent.sh HOST COMMAND..." runs COMMAND
# (the orted launch line, a shell string) inside the network namespace named HOST, with HOST
# as its hostname (its own UTS namespace), as on a real machine of that name.
# mpirun passes the hostfile's name as HOST; the namespace carries the same name.
host="$1"
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname \"\$0\" && exec /bin/sh -c \"\$1\"" "$host" "$*"
