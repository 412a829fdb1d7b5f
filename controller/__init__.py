"""The Kubernetes controller (ModelServing, ModelBooster, autoscaling). Step 4 onwards."""
