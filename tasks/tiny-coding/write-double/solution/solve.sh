#!/bin/bash
echo 'def double(x): return 2 * x' > double.py
