"""Training the toy pi0.5 on the tabletop world: demonstrations, losses, the training command and the closed-loop
evaluation of a trained model (``oxygen-train-toy``, ``oxygen-evaluate-toy``)."""
