#!/usr/bin/env bash
# On the GPU machine: the router forward kernel's SASS lines with the most executed instructions
# (ncu's source page), for the DeepSeek-V3 configuration of bench/profile_moe_ops.py, or its
# sigmoid top-8 one with SFMOE_PROFILE_ROUTER=sigmoid.
# Usage: PYTHONPATH=<build-py>/python bench/profile_router_sass.sh [lines]
set -uo pipefail
cd "$(dirname "$0")"
exec ./profile_sass.sh router_forward_kernel 1 "${1:-70}" -- python3 profile_moe_ops.py
