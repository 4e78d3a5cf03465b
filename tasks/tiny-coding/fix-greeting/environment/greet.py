def greet(name):
    return "Helo, " + name
