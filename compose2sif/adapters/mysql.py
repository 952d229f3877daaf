"""MySQL and MariaDB: `--port` and `--bind-address` on mysqld's command line."""
from compose2sif.adapters.base import Adapter
from compose2sif.plan.knobs import Knob

ADAPTER = Adapter(
    family="mysql",
    images=r"(^|/)(mysql|mariadb|percona)(-server)?$",
    ports={3306: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--bind-address", "{address}"),
    default_command=("mysqld",),
    writable=("/var/run/mysqld", "/run/mysqld"),
    workdir="/",  # the image's WORKDIR
)
