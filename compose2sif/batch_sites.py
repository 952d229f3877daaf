"""Site conventions for `compose2sif batch`, as data: how each MPI launches one task per node, and what
the resource groups of known sites allow. `--site-file FILE` (JSON, the shape of SITES) adds a site
or replaces one; nothing here is code.

Launcher words: "{nodes}" is the job's node count; "$NAME" is the job's environment variable NAME
at run time (PJM sets PJM_MPI_PROC and PJM_O_NODEINF); every other word is written as it is.
Directives may hold "{nodes}" too.
"""

MPI_STYLES = {
    # Slurm's own launcher: one task per node, the step killed if one task fails
    "srun": {
        "scheduler": "slurm",
        "directives": [],
        "env": {},
        "launcher": ["srun", "--nodes={nodes}", "--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"],
    },
    # OpenMPI under PJM, started through pjrsh on the nodes of PJM's node file. Without
    # --map-by ppr:1:node OpenMPI fills the first node's slots first: both ranks on one node.
    "openmpi": {
        "scheduler": "pjm",
        "directives": ["#PJM --mpi proc={nodes}"],
        "env": {"OMPI_MCA_plm_rsh_agent": "/bin/pjrsh"},
        "launcher": ["mpirun", "-np", "$PJM_MPI_PROC", "-machinefile", "$PJM_O_NODEINF", "--map-by", "ppr:1:node"],
    },
    # Fujitsu MPI (Technical Computing Suite): PJM places the ranks, one per node by node order
    "fujitsu": {
        "scheduler": "pjm",
        "directives": ["#PJM --mpi proc={nodes}", "#PJM --mpi rank-map-bynode"],
        "env": {},
        "launcher": ["mpiexec", "-n", "{nodes}"],
    },
}

SITES = {
    # Nagoya University's "Flow" Type II subsystem: 4 V100 per node, PJM, OpenMPI 4.0.5 (the usage
    # its documentation gives: #PJM --mpi proc=N, OMPI_MCA_plm_rsh_agent=/bin/pjrsh, mpirun -np
    # $PJM_MPI_PROC -machinefile $PJM_O_NODEINF). Only cx-share takes `-L gpu=` (a share of one
    # node); other groups hand out whole nodes. Groups not listed are not checked (one warning).
    "flow": {
        "scheduler": "pjm",
        "mpi": "openmpi",
        "gpus_per_node": 4,
        "groups": {
            "cx-share": {"gpu": True, "max_nodes": 1},
        },
    },
}
