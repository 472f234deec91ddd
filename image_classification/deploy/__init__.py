"""Deployment: a trained model put to use."""
