"""capture_proxy"""
