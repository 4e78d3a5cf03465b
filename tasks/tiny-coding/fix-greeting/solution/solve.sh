#!/bin/bash
sed -i 's/Helo/Hello/' greet.py
