"""What a session offers besides notebooks: terminal, R, VS Code, git, TensorBoard, and the guard of /proxy/<port>/."""
