"""HTTP: the fast lane and routes, the middleware list, one folder per completion route (handler / convert /
frames), and the responses and streaming they share.
"""
