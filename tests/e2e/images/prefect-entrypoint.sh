#!/usr/bin/env bash
# A LOOK-ALIKE of PrefectHQ/prefect's scripts/entrypoint.sh @ce79dd3d: source ~/.bashrc where
# there is one, install EXTRA_PIP_PACKAGES, then run the command; with none, a banner and a shell.
set -e
# shellcheck disable=SC1090  # the user's own
if [ -f ~/.bashrc ]; then . ~/.bashrc; fi
if [ -n "${EXTRA_PIP_PACKAGES:-}" ]; then
    echo "+pip install $EXTRA_PIP_PACKAGES"
    # shellcheck disable=SC2086  # a list of packages, as upstream passes it
    pip install $EXTRA_PIP_PACKAGES
fi
if [ -z "$*" ]; then
    echo "Prefect $(prefect version --omit-integrations 2>/dev/null | head -n 1)"
    exec bash --login
fi
exec "$@"
