"""Live traffic on a Ray cluster: `openai-compat serve --ray` (launch.py) deploys our app as a
Ray Serve ingress (deployments.Ingress) in front of one deployment per model
(deployments.ModelServer), which it calls through DeploymentHandles (remote.py)."""
