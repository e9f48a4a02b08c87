from vgpu_operator.cli import main

main()
