"""MySQL and MariaDB: `--port` and `--bind-address` on mysqld's command line. Their clients
(mysqladmin in healthchecks) read a password from MYSQL_PWD as well as from `-pPW`."""
from compose2sif.adapters.base import Adapter, PasswordClient
from compose2sif.types import Knob

CLIENTS = tuple(PasswordClient(command, "MYSQL_PWD", attached=("-p", "--password="))
                for command in ("mysqladmin", "mysql"))

ADAPTER = Adapter(
    family="mysql",
    images=r"(^|/)(mysql|mariadb|percona)(-server)?$",
    ports={3306: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--bind-address", "{address}"),
    default_command=("mysqld",),
    writable=("/var/run/mysqld", "/run/mysqld"),
    workdir="/",  # the image's WORKDIR
    clients=CLIENTS,
)
