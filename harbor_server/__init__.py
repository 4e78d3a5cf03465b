"""harbor_server"""
