"""Deployments, the analytic cost model, calibration and the search driver."""

from specc.search.deployments import BUILTIN, Deployment, deployment_names, get_deployment

__all__ = ["BUILTIN", "Deployment", "deployment_names", "get_deployment"]
