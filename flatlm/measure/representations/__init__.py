"""How the representations relate to the truth: linear CKA to the true parse posteriors."""
