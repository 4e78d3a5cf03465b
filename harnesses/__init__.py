"""harnesses"""
